set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/real/rho-gain.png'
set title 'rho-gain: a representation''s rho against its net TPOT gain, Llama-4-Maverick-17B-128E-Instruct'
set xlabel 'rho (fit quality)'
set ylabel 'net TPOT gain (%)'
$d0 << EOD
0.717031 -5.30028
0.66282 -5.20725
0.657372 -4.89744
0.642444 -5.31745
0.682063 -5.14724
0.64063 -4.90186
0.579311 -4.76515
0.543014 -4.23159
EOD
unset key
plot $d0 using 1:2 with points pt 7 lt 1 dt 1 title 'ELDR net of the replay control'
