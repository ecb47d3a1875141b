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
set output 'docs/results/realistic/table2.png'
set title 'table2'
set xlabel 'decode workers'
set ylabel 'mean TPOT vs best baseline (%)'
$d0 << EOD
8 -9.20889 -1.29249 -7.91641
16 -9.18661 -1.12174 -8.06487
24 -9.53643 -1.24022 -8.29622
EOD
plot $d0 using 1:2 with linespoints title 'gain_pct', $d0 using 1:3 with linespoints title 'control_pct', $d0 using 1:4 with linespoints title 'net_pct'
